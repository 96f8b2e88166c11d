"""What every part of the pipeline stands on, without torch: errors users can act on, atomic
files and markers, the run folder's paths, the launcher's lock, and what a step is."""
