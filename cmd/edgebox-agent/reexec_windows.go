package main

// reexec does nothing on Windows, which cannot replace a running process:
// the agent exits, and the service manager, told to restart the service
// on failure, starts it again as the launcher.
func reexec() {}
