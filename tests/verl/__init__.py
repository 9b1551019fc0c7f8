"""Tests that run in a verl 0.9.1 environment (.ci/run builds it): the adapter on real verl objects."""
