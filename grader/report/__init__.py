"""What people read: the student's feedback page, the class report, and the grades as an LMS imports them."""
