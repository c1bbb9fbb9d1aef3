"""Where shard jobs run: this machine's pool, Ray, or a scheduler given the plan file."""
