"""Small PettingZoo games for the multi-agent tests: ``--env-id fleetrl_test_games.coordinate`` (tests/ is on the path)."""
