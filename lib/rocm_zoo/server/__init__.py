"""The MONAI Label layer: the tasks, datastores, routes, log-in, batch and training glue, and error mapping; composed
by `rocm_zoo.app`. Importing it needs monailabel."""
