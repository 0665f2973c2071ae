"""A whole class: autograde's parallel workers, one result per hand-in, shards and their merge."""
