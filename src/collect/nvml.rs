//! NVIDIA GPU collector through NVML (placeholder; being written).
