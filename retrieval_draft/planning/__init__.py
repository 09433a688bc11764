"""Sizing each step's tree: measured forward cost (``cost``, ``cost_probe``, ``cost_file``),
acceptance calibration (``calibration``, ``rates_file``), the width that pays (``sizer``) and the
planner that combines them, with the grading of drafts and the gate on drafters (``planner``)."""
