"""The files every task starts from (reset before each run), and what some of them must hold afterwards."""

NOTES = """\
buy milk
call the plumber about the kitchen leak
renew passport before June
return library books (due Friday)
send Ana the photos from the trip
pay the electricity bill
"""

STANDUP = """\
# Stand-up, 2 November 2026

Present: Mira, Jonas, Priya, Tom.

Hiring. The backend team is two people short since October and the on-call rotation is thin.
Mira showed the pipeline: eleven applications, three worth a first call. Tom asked whether a
contractor could cover the gap until spring; Priya said the last two renewals cost more than a
hire would.

Decisions:
- Open a second backend engineering position this week.
- Mira runs the interview loop; Jonas joins the system-design round.
- No contractor renewals until January.

Other: the office heating is fixed; the quarterly all-hands moves to 4 December.
"""

PLATFORM = """\
# Platform meeting, 9 November 2026

Present: Jonas, Priya, Sam, Lena.

Atlas migration. Sam walked through the dry run on staging: replication lag stayed under two
seconds and the schema converter handled every table except the audit partitions, which need a
manual step. Lena worried about the billing cut-over landing in the same week as the invoice
run. The group agreed billing is the smallest service with a clean rollback path, so it should
go first.

Decisions:
- Billing moves to Atlas first, in the week of 23 November.
- The old cluster stays read-only for 30 days after the cut-over.
- Jonas owns the rollback runbook.
- Load test at twice peak traffic before the switch.

Open questions: who signs off on the audit-partition step; whether search follows in December.
"""

RETRO = """\
# Retrospective, 16 November 2026

Present: Mira, Tom, Lena, Priya.

The 12 November outage: a certificate expired on the internal gateway at 03:10 and alerts went
to a channel nobody watches at night. Time to detect was 41 minutes, time to fix 9 minutes.

What went well: the status page went up quickly; the fix was a one-line change.
What went badly: the expiry warning had fired for three weeks without an owner.

Actions:
- Route certificate-expiry alerts to the on-call pager.
- Tom adds an expiry check to the weekly report.
- Lena writes up the timeline for the customer newsletter.
"""

APP_INI = """\
[server]
host = 0.0.0.0
port = 8080
workers = 4

[database]
url = postgres://app@db.internal/app
pool_size = 10

[logging]
level = info
"""

APP_EXAMPLE_INI = """\
; Example configuration: copy to app.ini and fill in the values.
[server]
host = 127.0.0.1
port = 8080
workers = 1

[database]
url = postgres://user:password@localhost/app
pool_size = 2

[logging]
level = debug
"""

Q1_REPORT = """\
# Q1 2026 report

Revenue came in at 1.84 M, 6 % over plan, driven by the annual renewals in February. Churn held
at 1.9 % a month. Support tickets fell by a fifth after the new onboarding guide shipped.

Costs: infrastructure spend rose 11 % with the new region; headcount flat at 23.

Next quarter: finish the search rewrite, start the Atlas evaluation, hire one backend engineer.
"""

Q2_REPORT = """\
# Q2 2026 report

Revenue 1.91 M, on plan. Churn up slightly to 2.1 % after the price change in April. The search
rewrite shipped in June and cut p95 query time from 900 ms to 240 ms.

Next quarter: Atlas migration plan, second region failover test.
"""

CAR = """\
# Car

Insurance renews on 1 January; the current policy covers roadside assistance.
TODO: book the winter tyre change
Service history is in the glovebox folder.
TODO: renew the parking permit
"""

GARDEN = """\
# Garden

The apple tree needs pruning after the leaves drop.
TODO: order tulip bulbs
Compost bin is full; the council collects garden waste on Mondays.
"""

HOUSE = """\
# House

Boiler serviced in September, next due next September.
TODO: fix the dripping bathroom tap
TODO: clear the gutters before December
Spare keys are with the neighbours at number 12.
"""

PANCAKES = """\
# Buttermilk pancakes (serves 4)

Ingredients:
- 250 g plain flour
- 2 tsp baking powder
- 1 tsp bicarbonate of soda
- 2 tbsp sugar
- 400 ml buttermilk
- 2 eggs
- 40 g melted butter

Method: whisk the dry ingredients, beat in the buttermilk, eggs and butter, rest ten minutes,
cook on a medium pan until bubbles form, then flip.
"""

SCONES = """\
# Cheese scones (makes 8)

Ingredients:
- 225 g self-raising flour
- 55 g cold butter
- 100 g grated cheddar
- 150 ml milk

Method: rub the butter into the flour, stir in cheese and milk, pat out 2 cm thick, cut and bake
at 220 C for 12 minutes.
"""

SOUP = """\
# Tomato soup (serves 4)

Ingredients:
- 1 kg ripe tomatoes
- 1 onion
- 2 cloves garlic
- 500 ml vegetable stock
- 2 tbsp olive oil

Method: soften onion and garlic in the oil, add tomatoes and stock, simmer 20 minutes, blend.
"""

STATUS = """\
# Release 2.4.0

Status: in review
Owner: Priya
Target date: 2026-11-28

Scope: new export dialog, faster search index, fix for the CSV date bug.
"""

CHANGELOG = """\
# Changelog

## 2.3.1
- Fix a crash when the settings file is empty.

## 2.3.0
- Dark mode.
- Keyboard shortcuts in the editor.
"""

FILES: dict[str, str] = {
    "notes.txt": NOTES,
    "meetings/2026-11-02-standup.md": STANDUP,
    "meetings/2026-11-09-platform.md": PLATFORM,
    "meetings/2026-11-16-retro.md": RETRO,
    "config/app.ini": APP_INI,
    "config/app.example.ini": APP_EXAMPLE_INI,
    "reports/q1-report.md": Q1_REPORT,
    "reports/q2-report.md": Q2_REPORT,
    "projects/car.md": CAR,
    "projects/garden.md": GARDEN,
    "projects/house.md": HOUSE,
    "recipes/pancakes.md": PANCAKES,
    "recipes/scones.md": SCONES,
    "recipes/soup.md": SOUP,
    "status.md": STATUS,
    "changelog.md": CHANGELOG,
}

ATLAS_SUMMARY = """\
# Atlas migration: decisions (platform meeting, 9 November 2026)

- Billing moves to Atlas first, in the week of 23 November.
- The old cluster stays read-only for 30 days after the cut-over.
- Jonas owns the rollback runbook.
- Load test at twice peak traffic before the switch.
"""

WRONG_ATLAS_SUMMARY = """\
# Atlas migration: decisions (2 November 2026)

- Open a second backend engineering position.
- Mira runs the interview loop.
- No contractor renewals until January.
"""

TODOS = """\
book the winter tyre change
renew the parking permit
order tulip bulbs
fix the dripping bathroom tap
clear the gutters before December
"""

SHOPPING = """\
250 g plain flour
2 tsp baking powder
1 tsp bicarbonate of soda
2 tbsp sugar
400 ml buttermilk
2 eggs
40 g melted butter
"""

RELEASE_ENTRY = "## 2.4.0\n- New export dialog.\n- Faster search index.\n- Fix for the CSV date bug.\n\n"
WRONG_RELEASE_ENTRY = RELEASE_ENTRY.replace("2.4.0", "2.3.1", 1)
CHANGELOG_AFTER = CHANGELOG.replace("## 2.3.1", RELEASE_ENTRY + "## 2.3.1", 1)
WRONG_CHANGELOG_AFTER = CHANGELOG.replace("## 2.3.1", WRONG_RELEASE_ENTRY + "## 2.3.1", 1)
