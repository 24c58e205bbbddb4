"""HTTP plumbing: MONAI Label's routes served off the event loop, requests admitted into the scheduler's queues,
answers that name no server path, which images a request may name, and clear 4xx errors."""
