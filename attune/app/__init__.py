"""The application: the `attune` CLI, the campaign runner, reports and the headless launcher."""
