"""The MONAI Label layer: the app's composition (Zoo), the tasks, datastores, routes and error mapping.
Importing it needs monailabel."""
