// Package browser tests the web console in a real browser: Debian's
// Chromium, driven by playwright-core from web/tests, against a real
// console and real agents (the built binaries; for a VM's screen, a
// console and an agent with the qemu driver in the test's process). Each
// test saves a screenshot of every page it visits under
// $EDGEBOX_SCREENSHOTS (default: the system's temporary directory,
// edgebox-screenshots/<test>) and names the folder in its output.
package browser
