"""Batch segmentation on Ray workers, one warm worker per GPU, on one host or several."""
