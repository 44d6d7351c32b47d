"""The tests, one folder per layer of the package they test; `support` holds what they share."""
