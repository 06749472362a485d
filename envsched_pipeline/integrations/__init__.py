"""envsched inside other trainers' loops (each module loads its trainer's packages only when used)."""
