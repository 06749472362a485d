-- Documented DuckDB views over the lake. Base views (one per Parquet table: environments, tasks,
-- topologies, edges, manifests, rollouts, statistics, train_metrics, evals, eval_rollouts, audits) are created
-- by envsched_pipeline.lake.Lake.connect(); these derived views are built on top of them.
-- Try: envsched sql "select * from step_summary"

-- One row per training step: the numbers the scheduler is judged by.
CREATE VIEW step_summary AS
SELECT g.step,
       count(*)                                        AS groups,
       avg(g.var)                                      AS batch_variance,
       avg(CASE WHEN g.spread THEN 0.0 ELSE 1.0 END)   AS zero_variance_fraction,
       count(DISTINCT g.env_id)                        AS envs_touched,
       avg(g.mean)                                     AS mean_reward,
       median(g.mean)                                  AS median_reward,
       sum(g.n)                                        AS rollouts
FROM (
    SELECT step, task_id, any_value(env_id) AS env_id, var_pop(reward) AS var, avg(reward) AS mean,
           max(reward) - min(reward) > 1e-6 AS spread, count(*) AS n
    FROM rollouts GROUP BY step, task_id
) g
GROUP BY g.step
ORDER BY g.step;

-- Per environment: how often it was scheduled and how its groups turned out.
CREATE VIEW env_coverage AS
SELECT r.env_id,
       count(DISTINCT r.step)                  AS steps_touched,
       count(DISTINCT r.task_id)               AS tasks_seen,
       count(*)                                AS rollouts,
       avg(r.reward)                           AS mean_reward,
       max(r.step)                             AS last_step
FROM rollouts r
GROUP BY r.env_id
ORDER BY rollouts DESC;

-- Every group a task got: the history the scheduler learns from.
CREATE VIEW task_history AS
SELECT step, task_id, any_value(env_id) AS env_id, count(*) AS rollouts,
       avg(reward) AS mean_reward, var_pop(reward) AS reward_variance,
       max(reward) - min(reward) > 1e-6 AS informative
FROM rollouts
GROUP BY step, task_id
ORDER BY task_id, step;

-- Selection reasons flattened: predicted vs realized variance for every pick.
CREATE VIEW pick_reasons AS
SELECT s.step, s.slot, s.task_id, s.env_id, s.half, s.score, s.pred_var, s.p_nonzero, s.propensity,
       s.scheduler, s.reason, h.reward_variance AS realized_variance, h.informative
FROM manifests s
LEFT JOIN task_history h ON h.step = s.step AND h.task_id = s.task_id
ORDER BY s.step, s.slot;

-- Held-out evaluation per environment: how the policy does on the evaluation split (tasks of the
-- training environments the pool leaves out: split 'seen'; environments never trained on: 'unseen')
-- at each step that evaluated (neural and LM policies).
CREATE VIEW heldout_by_env AS
SELECT step, split, env_id, count(DISTINCT task_id) AS tasks, count(*) AS episodes,
       avg(reward) AS mean_reward, avg(CASE WHEN reward >= 1 - 1e-9 THEN 1.0 ELSE 0.0 END) AS solved
FROM eval_rollouts
GROUP BY step, split, env_id
ORDER BY step, split, env_id;

-- Held-out success over repeated attempts, per step, split and k (1 up to the episodes a task has):
-- pass_at_k, the chance that at least one of k attempts solves a task, and pass_hat_k, that all k
-- do (tau-bench's pass^k); each the unbiased estimate from a task's n episodes of which c solved it
-- (reward 1), 1 - C(n-c, k) / C(n, k) and C(c, k) / C(n, k), averaged over the tasks with n >= k.
-- Standard errors: `envsched evaluate`, `envsched report` (envsched_pipeline/analysis/passk.py).
CREATE VIEW heldout_pass_at_k AS
WITH per_task AS (
    SELECT step, split, task_id, count(*) AS n,
           sum(CASE WHEN reward >= 1 - 1e-9 THEN 1 ELSE 0 END) AS c
    FROM eval_rollouts
    GROUP BY step, split, task_id
), per_k AS (
    SELECT step, split, task_id, n, c, unnest(range(1, n + 1)) AS k FROM per_task
)
SELECT step, split, k, count(*) AS tasks,
       avg(1 - list_product(list_transform(range(k), lambda i: (n - c - i)::DOUBLE / (n - i)))) AS pass_at_k,
       avg(list_product(list_transform(range(k), lambda i: (c - i)::DOUBLE / (n - i)))) AS pass_hat_k
FROM per_k
GROUP BY step, split, k
ORDER BY step, split, k;
