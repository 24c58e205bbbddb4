"""The audit trail (`trail`: the hash-chained file) and what records to it over HTTP (`routes`)."""
