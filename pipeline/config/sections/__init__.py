"""The config's sections, a module each (or a few that belong together); pipeline.config.schema
joins them into PipelineConfig and re-exports them."""
