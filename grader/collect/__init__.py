"""Collection: hand-ins found in a folder or an LMS zip, their hand-in times, deadlines and extensions."""
