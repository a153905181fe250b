"""The study's model of its configurations, below the stages that use it: the estimator
over the study's space (`estimator_model`), corrected by the trials measured
(`correction`, `step_fit`, `part_fit`), and its belief of an unmeasured one
(`surrogate`). The search, the final phases and each trial read it; it imports nothing
else of tune/."""
