"""The hostile-input corpus of tests/test_hostile_input.py."""
