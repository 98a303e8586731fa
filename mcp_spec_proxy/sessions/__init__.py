"""A client's session: the barrier that runs its reads at once and holds its writes, and its named sessions."""
