"""The local datastore and what enters it: uploads checked before they are stored, archives unpacked inside their
folder, labels written atomically, and MONAI Label's upload routes replaced."""
