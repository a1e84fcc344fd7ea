"""Active checks (level 2): they run workloads in spawned ranks."""
