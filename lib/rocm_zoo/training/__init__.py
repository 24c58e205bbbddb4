"""The annotation loop's engine: a bundle's own train config run with the overlay, at the device scheduler's lowest
class, and the checkpoints it produces. Knows nothing of MONAI Label: the server wraps it as train tasks and routes."""

from rocm_zoo.training.checkpoints import Checkpoint, CheckpointStore, TrainingDetails

__all__ = ["Checkpoint", "CheckpointStore", "TrainingDetails"]
