"""fabricscope: grey-failure observability for GPU clusters."""
