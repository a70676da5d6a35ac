"""Kernel side: the files a launch leaves and takes back (log folders, the cell's script beside the
notebook, pushed and pulled values) and the watcher that cleans up after a killed kernel."""
