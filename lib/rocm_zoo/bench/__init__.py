"""Benchmarks and the tools they and the tests drive: workloads, a server child process, a local Orthanc PACS,
OHIF in headless Chromium. Never imported by the server at run time."""
