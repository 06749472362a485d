"""Building the dual-relation task graph from task text: feature views, abstract topologies
(offline or through an LLM), sparse top-k construction, and its storage in the lake. The scheduler
only *uses* a built graph (:class:`envsched_pipeline.scheduler.graph.TaskGraph`)."""
