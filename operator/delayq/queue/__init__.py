"""The delay-queue engine: slot-sharded Redis store with two-phase (claim → ack) consumption."""
