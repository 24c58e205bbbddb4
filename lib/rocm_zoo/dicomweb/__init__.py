"""A DICOMweb PACS as the datastore: series checks and cache, labels back as DICOM SEG."""
