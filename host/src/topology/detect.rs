//! Local topology detection (sysfs, NVML). Being written.
