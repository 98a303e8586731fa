"""The one gate: the policy that chooses a reviewer per call (rules, access), the read door, the write
path, results, the audit trail and the drain."""
