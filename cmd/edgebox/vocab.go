package main

// The CLI's tables say yes or no, never true or false: a bool goes
// through yesNo (vocab_test.go refuses one printed any other way).
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
