"""A node's shards in a process of their own (issue 35): the front end (the public gRPC port)
relays each call over a framed channel on a Unix socket to the shard process, which runs the
node's shards, its interceptors and its servicers as a node in one process does."""
