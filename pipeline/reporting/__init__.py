"""What a run says about itself, from the files its steps wrote: summary.json, the plots,
report.md / report.html, and a sweep's comparison table."""
