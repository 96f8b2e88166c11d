"""Planning a run before anything is submitted, by arithmetic alone (no torch): memory per GPU
and expected speed of a parallel layout, the search for the fastest layout that fits, the
checks that refuse what would fail in the queue, and the plan printed for users."""
