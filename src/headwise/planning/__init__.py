"""Planning (issue 18): combine the methods under a user's budget, measure the candidates on the task, and
recommend one edit. Sits with tasks and training: it imports methods and tasks; report and cli import it."""

from .budget import AXES, Budget
from .costs import Costs, measure_latency, static_costs
from .edits import Edit, apply_edit
from .pareto import front
from .plan import SCHEMA, Plan, Point, plan

__all__ = ["AXES", "Budget", "Costs", "static_costs", "measure_latency", "Edit", "apply_edit", "front", "Plan",
           "Point", "plan", "SCHEMA"]
