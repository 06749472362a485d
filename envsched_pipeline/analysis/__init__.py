"""Tools that look at runs: the scheduler benchmark, offline replay, the HTML report and plots."""
