"""The example app's business rows: accounts and the invoices sent to them."""

from django.db import models


class Account(models.Model):
    name = models.CharField(max_length=100)
    email = models.EmailField()

    def __str__(self) -> str:
        return self.name


class Invoice(models.Model):
    """One invoice per (account, period): the unique constraint is the idempotency guard."""

    account = models.ForeignKey(Account, on_delete=models.CASCADE)
    period = models.CharField(max_length=7, help_text="YYYY-MM")
    amount_cents = models.PositiveIntegerField()
    job_id = models.BigIntegerField(help_text="the job that sent it")
    lease_version = models.BigIntegerField(help_text="the fencing token of the attempt that sent it")
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["account", "period"], name="one_invoice_per_period")]

    def __str__(self) -> str:
        return f"{self.account_id} {self.period}"


class FlakyAttempt(models.Model):
    """Attempts of the flaky task, counted so it can fail its first tries."""

    key = models.CharField(max_length=100, unique=True)
    tries = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.key}: {self.tries}"
