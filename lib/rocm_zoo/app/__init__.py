"""The composition root, above everything it composes: `MyApp` (the MONAI Label app: routes, datastore, tasks,
strategies, trainers, batch), the `Zoo` (bundles found, one task per registry entry over a shared pool, warmed),
the `--conf` settings (`config`), the warm heap moved out of the garbage collector's reach (`heap`), and the app
folder MONAI Label loads (`app_folder`, `app_main`). It alone imports `server`, `dicomweb` and `scale` together."""
