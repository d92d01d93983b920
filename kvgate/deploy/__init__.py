"""Starting deployments: the process supervisor, the one PD start sequence and the router's command
line, and the launch plan of real workers."""
