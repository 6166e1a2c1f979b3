"""The schedule IR: the Graph of ops on lanes with their values and pools, its static checks,
its printed form, and the measured Trace both engines record."""
