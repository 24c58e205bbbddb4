"""The annotation loop: trainings from the datastore's final labels with in-place weight swaps, their `/train`
routes, and the active-learning strategies that pick the next study to annotate."""
