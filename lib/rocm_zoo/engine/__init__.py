"""The engine: backend policy, bundle config + overlay, warm network pool, caches. Imports torch and MONAI only,
never monailabel."""
