package agent

import "path/filepath"

// VolumeDir is where the workloads' box-local volumes live on a box whose
// data directory is dataDir: <app>/<volume> each.
func VolumeDir(dataDir string) string { return filepath.Join(dataDir, "volumes") }
