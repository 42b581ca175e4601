"""Helpers several test folders share (model builders, fuzzing strategies, harnesses),
imported by package path."""
