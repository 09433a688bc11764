"""Sizing each step's tree: measured forward cost (``cost``, ``cost_file``), acceptance
calibration (``calibration``, ``rates_file``), which drafters to ask (``drafter_gate``)
and the planner that combines them (``planner``)."""
