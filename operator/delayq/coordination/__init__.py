"""Which process may consume which slot: ZooKeeper membership, assignment and ownership."""
