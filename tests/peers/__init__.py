"""Other projects' own test suites, run against ``ratelimit_app`` through import aliases."""
