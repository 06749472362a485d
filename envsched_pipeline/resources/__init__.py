"""Dagster resources: the lake, the trainer launcher, the LLM client. Switching local / GPU / k8s
means choosing a resource dict, never editing assets."""
