"""A toy fourth task: one directory, copied into src/grassflow/toy/ by tests/test_tasks.py."""
