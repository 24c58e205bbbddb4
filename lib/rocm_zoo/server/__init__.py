"""The MONAI Label layer, grouped by job: `http` (routes, request queues, answers, errors), `store` (the datastore,
uploads, archives, the label writer), `tasks` (the infer tasks), `auth` (log-in, roles, host checks), `batch` and
`annotation` (trainings from saved labels, active learning); composed by `rocm_zoo.app`. Importing it needs
monailabel."""
