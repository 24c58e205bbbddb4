"""Batch segmentation of datastore studies, in the server process by default, and its `/batch/infer` routes."""
