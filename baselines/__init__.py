"""What serving engines do today: state-caching baselines with the same call shapes as ReplaySSM."""
