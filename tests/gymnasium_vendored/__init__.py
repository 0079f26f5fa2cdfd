"""Test envs, spaces and helpers vendored from gymnasium's own test suite (MIT), for make_vec's conformance tests."""
