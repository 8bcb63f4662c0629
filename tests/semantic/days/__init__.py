"""Generated support-bot days, the adversarial set and their scorer (issue 23, items 5 and 6):
the data and measurement side that the issue's acceptance tests and bench/semantic_days.py use.

Contract with the semantic layer's side (who writes the acceptance asserts):

    from tests.semantic.days import adversarial, corpus, day, gateway_run, scoring

    bot = day.support_bot("banking77", phrasings=1)        # or "hwu64"; phrasings=3
    day1, day2 = day.bot_day(bot, 1), day.bot_day(bot, 2)   # 3,000 requests each by default
    labels = {**bot.label_of(), **extra}                    # every text the upstream may see
    with gateway_run.day_gateway(tmp / "d1", labels, phrasings=bot.phrasings,
                                 request_log=tmp / "day1.jsonl") as gw:        # semantic off
        scoring.Scorer(bot.phrasings).add(day1.requests, gw.run(bot.system, day1.requests))
    # infercache tune tmp/day1.jsonl --fit --target-false-hit 0.01 --write-config c.toml
    with gateway_run.day_gateway(tmp / "d2", labels, phrasings=bot.phrasings,
                                 flags=("--semantic", "--config", str(c))) as gw:
        score = scoring.Scorer(bot.phrasings).add(day2.requests, gw.run(bot.system, day2.requests))
    score.recall, score.wrong_share, score.ood_answered, score.attacks_served

- acceptance 1: `corpus.acceptance_ood()` (300 held-out questions, none in the packaged set
  `infercache.semantic.ood_set`), asked after some banking requests; `score.ood_answered`.
- acceptance 2/3/4: days of both bots; the same Scorer across day 1 and day 2 when one gateway
  serves both (shadow); cross-domain = tune on one bot's day-1 log, serve the other bot's day 2.
- acceptance 5: `adversarial.attack_requests(adversarial.attacks(100))` → `attacks_served`;
  `adversarial.swap_requests(adversarial.swaps())` → `wrong`. Their texts' labels:
  `{r.text: r.label for r in requests}` (add them to `labels`).
The generators are deterministic for a seed; they read only tests/semantic/data. Nothing here
asserts a figure of the semantic layer: the tests of this package check the data and the scorer.
"""
