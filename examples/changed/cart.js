// Sum of the cart's line totals: cartTotal([{price: 5, quantity: 2}]) === 10.
export function cartTotal(items) {
  return items.reduce((total, item) => total + item.price * item.quantity);
}
